"""`trtforge build`: ONNX model -> engine for one GPU target, validated, published to the engine store.

The pipeline lives in :mod:`trtforge_builder.pipeline` (:func:`~trtforge_builder.pipeline.run_build`),
the command line in :mod:`trtforge_builder.cli`, the backends (TensorRT, ONNX Runtime) in
:mod:`trtforge_builder.backends`. Never imports kopf or a Kubernetes client.
"""
