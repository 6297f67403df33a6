"""Framework objects that keep the model's magnitude: embeddings for the frameworks' own vector
stores, and retrievers over a :class:`~magretrieve.serving.retriever.Retriever`.

- :mod:`magretrieve.integrations.langchain`: ``MagRetrieveEmbeddings`` (``Embeddings``) and
  ``MagRetrieveRetriever(retriever=..., k=5)`` (``pip install 'magretrieve[langchain]'``);
- :mod:`magretrieve.integrations.llama_index`: ``MagRetrieveEmbedding`` (``BaseEmbedding``) and
  ``MagRetrieveRetriever(retriever=..., similarity_top_k=5)``
  (``pip install 'magretrieve[llama-index]'``);
- :mod:`magretrieve.integrations.haystack`: components ``MagRetrieveTextEmbedder``,
  ``MagRetrieveDocumentEmbedder`` and ``MagRetrieveRetriever`` (``pip install 'magretrieve[haystack]'``);
- :mod:`magretrieve.integrations.vector_stores`: ``check_vector_store`` reads whether a
  framework's store ranks by inner product (and warns when it drops the magnitude).

The embeddings run an export in this process or call ``magretrieve serve``
(:mod:`magretrieve.serving.remote`: one deadline per request, no redirect followed, the key
in no text, dump or pickle); queries go through the query graph, documents through the
document graph. The retrievers rank by the model's inner product and put ``id``, ``score``,
``doc_norm``, ``cosine`` (and the payload) in each result's metadata. Nothing here is imported
by ``import magretrieve``. See docs/integrations.md.
"""
