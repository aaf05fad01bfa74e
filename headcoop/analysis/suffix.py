"""Folded into `headcoop.analysis.kernels` (issue 36: a block's attention and MLP arithmetic in one place);
this name is that very module, for code that imported it."""

import sys

from headcoop.analysis import kernels

sys.modules[__name__] = kernels
