"""isthmus.converters: ONNX import and export (edge flatbuffer export and int8 quantization to come)."""
from .onnx_export import ExportError, exportable_ops, to_onnx
from .onnx_import import OnnxImportError, from_onnx, supported_ops

__all__ = ["to_onnx", "from_onnx", "ExportError", "OnnxImportError", "exportable_ops", "supported_ops"]
