"""RNA's trainer for training scripts: ``dtlaunch.rna.Trainer`` (see
``dtlaunch.runtime.rna``). Importing it loads torch."""

from dtlaunch.runtime.rna import Trainer

__all__ = ["Trainer"]
