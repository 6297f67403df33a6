"""Math and contracts: the similarity family, errors, configs, the export manifest, metrics.

Depends on numpy only; every other layer may import it."""
