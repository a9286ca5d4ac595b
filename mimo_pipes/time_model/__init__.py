"""The vision encoder's time model: integer terms fitted to timed forwards (``mimo-pipes calibrate``), read by
``--reorder-cost-model``. ``model`` holds the terms and the file format, ``fit`` the fit, ``calibrate`` the
timing (the only part that needs torch)."""

from mimo_pipes.time_model.fit import fit_time_model
from mimo_pipes.time_model.model import TimeModel, TimeModelError, load_time_model, save_time_model

__all__ = ["TimeModel", "TimeModelError", "fit_time_model", "load_time_model", "save_time_model"]
