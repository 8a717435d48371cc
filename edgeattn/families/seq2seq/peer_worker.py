"""One variant of :mod:`edgeattn.families.seq2seq.peers` in its own process:
``python -m edgeattn.families.seq2seq.peer_worker SPEC`` prints its timings as one JSON line."""

from __future__ import annotations

import json
import logging
import sys
import warnings

from edgeattn.families.seq2seq.peers import worker

if __name__ == "__main__":
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    print(json.dumps(worker(json.loads(sys.argv[1]))))
