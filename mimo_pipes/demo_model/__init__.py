"""The demo trainer's model code (``mimo-pipes train``, ``mimo-pipes calibrate``): Qwen2-VL-style vision towers
built offline (``encoders``), the activation bridge between the vision and language ranks (``bridge``) and the
gradient all-reduce (``reduce``). Not part of the data pipeline: these move model tensors, not samples."""
