"""TreeGraft: two drafters (n-gram + a neural mid drafter) growing one shared draft tree, verified losslessly."""
__version__ = "0.1.0"
