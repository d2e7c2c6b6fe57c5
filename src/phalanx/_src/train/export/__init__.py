"""`Model.export`: a trained model leaves as a TF SavedModel or an ONNX file, for serving.

`api.export` checks the arguments and the installed converters (`versions`), resolves the
inputs' signature (`signature`: from `input_signature=`, else what fit / evaluate /
predict saw, else a Keras model's own inputs), and builds the inference function once
(`function`: the adapter's forward pass in inference mode, outputs as float32, the weights
as explicit arguments). `saved_model` converts it with jax2tf into a SavedModel whose
weights are variables; `onnx_graph` (with the operators of `onnx_ops`) translates the same
function's jaxpr into an ONNX graph whose weights are initializers. Either artifact is
checked against the function before it is moved into place.

TensorFlow and ONNX are needed only here, at export time (the `export` extra), and are
imported only when `export` is called.

May import: `adapters` and `api` (precision); never `loops`, `engine` or `model.py` (the
model is handed over at run time).
"""
