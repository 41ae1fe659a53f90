"""marin: a fully open language-model lab in miniature; every stage run is recorded in a hash-chained,
schema-validated ledger from which it can be audited and replayed bit for bit (README.md)."""
