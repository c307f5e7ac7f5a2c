"""Reporting: per-sample result files -> bootstrap intervals -> Tables 1-3, Figures 3-6, paper diff.

Modules: ``evaluations`` (result files -> task x run matrices), ``context`` (cached cells with bootstrap
intervals, shared CLI options, provenance header), ``paper`` (the paper's printed numbers), ``points``
(the figures' quantities), ``tts_context`` (context length of TTS runs: Figure 6's annotation and CSV),
and one module per CLI subcommand: ``aggregate_cmd``, ``tables``, ``figures``, ``diff``. Each subcommand
module exposes ``add_parser(subparsers)`` and ``run(args) -> int``.
"""
