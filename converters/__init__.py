"""isthmus.converters: ONNX import and export, TFLite import, edge flatbuffer export, int8 quantization."""
from .onnx_export import ExportError, exportable_ops, to_onnx
from .onnx_import import OnnxImportError, from_onnx, supported_ops
from .tflite_import import TFLiteImportError, from_tflite, supported_tflite_ops

__all__ = ["to_onnx", "from_onnx", "ExportError", "OnnxImportError", "exportable_ops", "supported_ops",
           "from_tflite", "TFLiteImportError", "supported_tflite_ops"]
