"""Loading models: :func:`load_model` turns a zoo name, a Hugging Face folder or hub id, a sinklab-trained
model or a ``sinklab train`` run folder into a :class:`LoadedModel`; :func:`is_run_folder` and
:func:`run_final_folder` know a run folder's layout. (Fetching the zoo's registry packages is
:mod:`sinklab.zoo`; a model with its probe, adapter, device and dtype is :class:`sinklab.subject.Subject`.)
"""

from sinklab.models.load import (NATIVE_MARKER, RUN_FILES, LoadedModel, ModelInfo, check_model_spec,
                                 input_device, is_encoder_config, is_run_folder, load_model, max_context_of, run_final_folder)

__all__ = ["load_model", "LoadedModel", "ModelInfo", "check_model_spec", "input_device", "is_encoder_config", "max_context_of",
           "is_run_folder", "run_final_folder", "NATIVE_MARKER", "RUN_FILES"]
