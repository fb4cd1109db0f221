import sys

from core.cli import main
from core.sandbox import harden_process
from core.settings import configure_scoring

# The CLI and the worker hold provider keys: other processes of the same user may not read them.
harden_process()
configure_scoring()
sys.exit(main())
