"""``max.interfaces``: universal interfaces between the parts of the MAX inference stack.

Requests (:mod:`.request`), sampling (:mod:`.sampling`), status (:mod:`.status`),
outputs (:mod:`.outputs`), log probabilities, context protocols (:mod:`.context`),
non-blocking queues (:mod:`.queue`), pipeline and scheduler contracts, LoRA requests,
and msgpack serialisation (:mod:`.msgpack`).
"""

from max.interfaces.context import BaseContext, InputContext
from max.interfaces.log_probabilities import LogProbabilities
from max.interfaces.lora import LoRAOperation, LoRARequest, LoRAResponse, LoRAStatus, LoRAType
from max.interfaces.msgpack import (
    MsgpackNumpyDecoder,
    MsgpackNumpyEncoder,
    SharedMemoryArray,
    msgpack_eq,
    msgpack_numpy_decoder,
    msgpack_numpy_encoder,
)
from max.interfaces.outputs import (
    AudioGenerationMetadata,
    AudioGeneratorOutput,
    EmbeddingsGenerationOutput,
    PipelineOutput,
    TextGenerationOutput,
)
from max.interfaces.pipeline import (
    AudioGenerator,
    EmbeddingsGenerationInputs,
    Pipeline,
    PipelineTask,
    PipelineTokenizer,
    TextGenerationInputs,
)
from max.interfaces.queue import MAXPullQueue, MAXPushQueue, drain_queue, get_blocking
from max.interfaces.request import (
    AudioGenerationRequest,
    Request,
    RequestID,
    TextGenerationRequest,
    TextGenerationRequestFunction,
    TextGenerationRequestMessage,
    TextGenerationRequestTool,
    TextGenerationResponseFormat,
    new_request_id,
)
from max.interfaces.sampling import BatchProcessorInputs, ProcessorInputs, SamplingParams, SamplingParamsInput
from max.interfaces.scheduler import RequestStep, Scheduler, SchedulerResult, StepPlan
from max.interfaces.status import GenerationStatus

__all__ = [
    "AudioGenerationMetadata",
    "AudioGenerationRequest",
    "AudioGenerator",
    "AudioGeneratorOutput",
    "BaseContext",
    "BatchProcessorInputs",
    "EmbeddingsGenerationInputs",
    "EmbeddingsGenerationOutput",
    "GenerationStatus",
    "InputContext",
    "LoRAOperation",
    "LoRARequest",
    "LoRAResponse",
    "LoRAStatus",
    "LoRAType",
    "LogProbabilities",
    "MAXPullQueue",
    "MAXPushQueue",
    "MsgpackNumpyDecoder",
    "MsgpackNumpyEncoder",
    "Pipeline",
    "PipelineOutput",
    "PipelineTask",
    "PipelineTokenizer",
    "ProcessorInputs",
    "Request",
    "RequestID",
    "SamplingParams",
    "SamplingParamsInput",
    "Scheduler",
    "SchedulerResult",
    "RequestStep",
    "StepPlan",
    "SharedMemoryArray",
    "TextGenerationInputs",
    "TextGenerationOutput",
    "TextGenerationRequest",
    "TextGenerationRequestFunction",
    "TextGenerationRequestMessage",
    "TextGenerationRequestTool",
    "TextGenerationResponseFormat",
    "drain_queue",
    "get_blocking",
    "msgpack_eq",
    "msgpack_numpy_decoder",
    "msgpack_numpy_encoder",
    "new_request_id",
]
