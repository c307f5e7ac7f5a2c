"""BFCL-v4 (pinned ``bfcl-eval==2026.3.23``), one module per idea: :mod:`.common` (category lists,
bfcl-eval data, tool schemas, ground-truth parsing), :mod:`.multi_turn` (the multi-turn episode over
bfcl-eval's classes), :mod:`.single_turn` (the AST categories and bfcl-eval's checker), :mod:`.agentic`
(memory and web-search categories) with :mod:`.memory` and :mod:`.web`, :mod:`.adapter` (the two
registered adapters) and :mod:`.leaderboard` (bfcl-eval's Overall groups). Imports go one way:
``common`` <- ``multi_turn``, ``single_turn``, ``memory``, ``web`` <- ``agentic`` <- ``adapter``;
``common`` <- ``leaderboard``.
"""
