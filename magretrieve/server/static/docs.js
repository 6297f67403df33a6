// Swagger UI over this server's /openapi.json, from the packaged swagger-ui-dist: no CDN, and
// no call to the public validator (validatorUrl null).
"use strict";

window.addEventListener("load", function () {
  const root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.openapi,
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis],
    showExtensions: true,
  });
});
