"""The data stages: fetch (pinned sources), curate (filters, deduplication, the split), tokenize and
evalsets, and the bounded readers of archives, JSONL and Parquet they share."""
