"""Framework retrievers over a :class:`~magretrieve.serving.retriever.Retriever` that keep the decomposition.

- :mod:`magretrieve.integrations.langchain`: ``MagRetrieveRetriever(retriever=..., k=5)``, a
  ``langchain_core`` ``BaseRetriever`` (``pip install 'magretrieve[langchain]'``);
- :mod:`magretrieve.integrations.llama_index`: ``MagRetrieveRetriever(retriever=...,
  similarity_top_k=5)``, a ``llama_index.core`` retriever (``pip install 'magretrieve[llama-index]'``);
- :mod:`magretrieve.integrations.haystack`: Haystack 2.x components ``MagRetrieveTextEmbedder``,
  ``MagRetrieveDocumentEmbedder`` and ``MagRetrieveRetriever`` (``pip install 'magretrieve[haystack]'``).

The frameworks' own vector-store integrations rank by cosine and drop the magnitude; these
rank by the model's inner product and put ``id``, ``score``, ``doc_norm``, ``cosine`` (and the
payload) in each result's metadata. Nothing here is imported by ``import magretrieve``.
"""
