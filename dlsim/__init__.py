"""dlsim: performance modelling and discrete-event simulation of parallel deep-learning training.

Importing the package does nothing but define names; the Python API lives in `dlsim.api`.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
