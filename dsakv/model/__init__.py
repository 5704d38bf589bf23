"""The DSA compute path in torch: MLA, the lightning indexer and its top-k, sparse MLA, the batch inputs
and the tiny random-weight DSA model that reads and writes the twin pool."""
