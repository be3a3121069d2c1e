"""The analysis: recorded torch.profiler traces → figures → what bounds the step → recommendations.

Torch-free, and never imports the trials, the search, the report or the code tools: `advisor analyze`
runs on any machine, fast. Data flows one way through it:

    reading (bytes, gunzip) → events (decoded, validated) → trace (`Trace`) → diagnosis (`Diagnosis`:
    steps, breakdown, kernels, copies, memory, the bound) → rules (`Recommendation`s) → analyze
    (`analyze_file`, `analyze_path`, the `advisor.analysis/1` JSON document)

Two runs compared: runs (each side: a session, a trial, a trace or a folder of ranks, its timing and
settings) → movers (time per kernel and operator, by name and family) → compare (`Comparison`: the verdict
against the noise, what moved, the `advisor.compare/1` document).

Nothing is imported here, so that the CLI can start reading a trace (`reading.prefetch`) before the
heavier modules load.
"""
