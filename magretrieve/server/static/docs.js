// Swagger UI over this server's /openapi.json, from the packaged swagger-ui-dist: no CDN, and
// no call to the public validator (validatorUrl null). On a keyed server "Authorize" takes the
// key; a tab opened by the search page gets the key that page holds by postMessage (same
// origin only, from the opener only), kept in Swagger UI's memory, never in web storage.
"use strict";

window.addEventListener("load", function () {
  const root = document.getElementById("swagger-ui");
  const opener = window.opener;
  const origin = window.location.origin;

  window.addEventListener("message", function (event) {
    if (event.origin !== origin || !opener || event.source !== opener) return;
    const data = event.data;
    if (!data || data.type !== "magretrieve-key" || typeof data.key !== "string") return;
    window.ui.preauthorizeApiKey(root.dataset.scheme, data.key);
  });

  window.ui = SwaggerUIBundle({
    url: root.dataset.openapi,
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis],
    showExtensions: true,
    persistAuthorization: false,
    onComplete: function () {
      // the schema is loaded: the search page that opened this tab may hand over its key
      if (opener) opener.postMessage({ type: "magretrieve-docs-ready" }, origin);
    },
  });
});
