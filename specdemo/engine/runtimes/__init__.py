"""Target runtimes: what runs the target's forwards. torch is the reference; ONNX Runtime
(onnxruntime-genai) is the second, with its export (`onnx_export`), its target behind the cached
LM's feed / score / roll-back calls (`onnx_lm`) and the feature head's steps beside it (`onnx_head`).
A further runtime goes here, as one more set of these modules."""
