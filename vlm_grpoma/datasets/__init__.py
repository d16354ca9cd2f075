"""Records, JSONL reading, synthetic datasets and converters from public formats."""
