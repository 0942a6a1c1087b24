"""What every layer of the project may import, and what imports nothing of the project itself:
storage (local disk and buckets), atomic writes, command-line plumbing, name checks, reading input
shards, and tokenisation."""
