"""Streaming generation with attention sinks (StreamingLLM, Xiao et al. 2024).

* :class:`SinkCache` -- a ``transformers`` Cache that keeps ``n_sink`` initial tokens and a window
  of recent ones, positions assigned inside the cache.
* :data:`POLICIES` -- the eviction policies a ``SinkCache`` takes by name (window, sinks, h2o, tova,
  sinks+h2o, sinks+tova, detected-sinks, and the prefill-time snapkv, pyramidkv, knorm), each at a
  fixed budget; keys and values stored as given
  or quantised (:mod:`sinklab.streaming.quant`).
* :func:`prefill` -- a prompt fed through a cache in chunks of its window (one call as an option);
  :func:`prefill_question` with the question inside or outside what a press scores.
* :func:`evaluate_stream` -- perplexity, agreement with the full cache, decode latency and cache memory of
  several cache configurations on one long token stream.
* :func:`stream` -- a streaming task (:data:`TASKS`: ``perplexity``, ``passkey``, ``needle``, ``ruler``) on a
  model, with one options object (:class:`PerplexityOptions`, :class:`PasskeyOptions`, :class:`NeedleOptions`,
  :class:`RulerOptions`); returns a Result, writes nothing (``sinklab stream TASK``).
"""

from sinklab.streaming.cache import SinkCache, SinkCacheLayer, StackedCache
from sinklab.streaming.policies import POLICIES
from sinklab.streaming.prefill import prefill, prefill_question
from sinklab.streaming.rope import KeyRotation, key_rotations
from sinklab.streaming.options import NeedleOptions, PasskeyOptions, PerplexityOptions, RulerOptions, StreamOptions
from sinklab.streaming.run import PasskeyResult, StreamResult, stream
from sinklab.streaming.longctx import TaskResult
from sinklab.streaming.task_registry import TASKS, StreamTask, register_task
from sinklab.streaming.harness import cache_specs, evaluate_stream, token_stream

__all__ = ["SinkCache", "SinkCacheLayer", "StackedCache", "POLICIES", "KeyRotation", "key_rotations", "stream",
           "prefill", "prefill_question",
           "StreamOptions", "PerplexityOptions", "PasskeyOptions", "NeedleOptions", "RulerOptions", "StreamResult",
           "PasskeyResult", "TaskResult", "TASKS",
           "StreamTask", "register_task",
           "cache_specs", "evaluate_stream",
           "token_stream"]
