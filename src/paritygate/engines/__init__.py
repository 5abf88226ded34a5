"""Every engine, one module each, behind the two protocols of :mod:`paritygate.engines.base`.

Tensor engines: ``torch_engine`` (the training path), ``onnxruntime_engine`` (an
ONNX artifact). Generation engines: ``hf_generate`` (HF ``generate`` with a KV
cache, CPU), ``vllm_engine`` (GPU). Each imports its dependency only when built.
"""
