"""What measures: one timed run of ours or a peer's (`runners`, `runtime_peers`), a whole interleaved
benchmark (`benchmark`, `schedule`, `threads`), the statistics, quality and acceptance over its rows,
and the tables, figures and report that present them. The suites built on it (the page benchmark, the
GPU suite, sweeps, precisions, KV policies, A/B) live one level up."""
