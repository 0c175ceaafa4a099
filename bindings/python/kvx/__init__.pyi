# Type stubs of the kvx package: the extension's names (_kvx.pyi), the codes
# as module constants (kvx.ENOTFOUND, ...) and the version.
from ._kvx import *  # noqa: F403

__version__: str
