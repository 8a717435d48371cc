"""``edgeattn run`` on a seq2seq export: each text's generated answer."""

from __future__ import annotations

from edgeattn.run_options import TEXT_GENERATION, RunHook, answer_text

RUN = RunHook(TEXT_GENERATION, answer_text)
