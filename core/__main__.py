import os
import sys

from core.cli import main
from core.domain.sandbox import harden_process
from core.settings import configure_scoring

# The CLI and the worker hold provider keys: other processes of the same user may not read them.
harden_process()
configure_scoring()
try:
    sys.exit(main())
except BrokenPipeError:  # output piped into `head`: stop quietly, as other command-line tools do
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
