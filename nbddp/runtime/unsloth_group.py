"""In a notebook that imports Unsloth, the process group starts right after that import completes, before the
notebook's next line: Unsloth's compile-cache barriers go out of step when the group exists during the import
(unsloth-zoo#967), and every later line can rely on the group."""
from .group import nbddp_dist
from .hooks import NBDDP_IMPORTS

NBDDP_IMPORTS.watch("unsloth", lambda module: nbddp_dist())
