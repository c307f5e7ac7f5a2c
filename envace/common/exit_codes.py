"""The exit statuses of ``envace`` commands (documented in ``envace --help`` and the user guide).

Besides these: 0 = success, 128+N = stopped by signal N (130 = Ctrl-C), and ``envace train`` passes on
verl's own status.
"""

#: a command that ran and failed; the message names why (a bad config or value, a missing model, a
#: self-check with unexplained failures, an incomplete evaluation, REFUTED claims with --strict, ...)
EXIT_FAILURE = 1
#: a usage error: argparse's own, or no command given
EXIT_USAGE = 2
#: a resource the command needs is unavailable: a model server that does not start, dies or stops
#: answering; a benchmark package that is not installed; a training driver that logged nothing for
#: ``training.step_timeout_min`` (stopped: a retry resumes from the last checkpoint)
EXIT_UNAVAILABLE = 3
#: input the command reads cannot be used: a results directory or training data that does not exist, a
#: corrupt result file, a manifest of another config
EXIT_UNUSABLE = 4
