"""The [sft] table: `turnstream sft`, a supervised warm start on chat transcripts (turnstream/sft/)."""
from __future__ import annotations

from pydantic import Field

from turnstream.core.config_fields import Section


class SftSection(Section):
    """Read by `turnstream sft` only. It trains model.path on transcripts rendered as the actors render a
    conversation, each at most vllm.max_model_len tokens; device, precision, the micro-batch budget, packing,
    attention, activation checkpointing, threads, gradient clipping and weight decay are the [learner] table's,
    and run.seed seeds the order."""

    transcripts: str = Field(
        "", description="JSON lines file, one transcript a line: {\"messages\": [{\"role\": \"system\" | \"user\" | "
        "\"assistant\", \"content\": \"...\"}, ...]} (OpenAI's chat format). Required by `turnstream sft`")
    output_dir: str = Field(
        "", description="where the trained Hugging Face checkpoint is written (new or empty; vLLM serves it, a "
        "run's model.path can name it); empty: the folder sft in run.run_dir")
    epochs: int = Field(1, ge=1, description="passes over the transcripts")
    max_steps: int = Field(0, ge=0, description="stop after this many optimizer steps; 0: after `epochs` passes")
    lr: float = Field(1e-5, gt=0, description="learning rate (constant; AdamW)")
    batch_transcripts: int = Field(8, ge=1, description="transcripts per optimizer step; the loss is the mean over "
                                   "their assistant tokens")
