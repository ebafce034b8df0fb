"""Parts of `benchmarks/validate_microbatch_cpu.py` (the μ-cuDNN CPU validation): the report it renders
(`report`, with the cause and drift sections of `cause`) and the per-kernel diagnosis whose record the
cause section draws (`diagnose`, run on its own: ``python benchmarks/microbatch_cpu/diagnose.py --help``)."""
