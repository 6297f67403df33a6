"""Environment variables magretrieve reads; their names are part of the contract."""

#: The API key of ``magretrieve serve`` (preferred over ``--api-key``, which shows in ``ps``).
API_KEY_ENV = "MAGRETRIEVE_API_KEY"
