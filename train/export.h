// Weights in the safetensors format (huggingface/safetensors: an 8-byte
// little-endian header length, a JSON header of {name: {dtype, shape,
// data_offsets}}, then the raw little-endian data), so other tools can read a
// tapeformer model and tapeformer can read theirs back.
//
//   export_safetensors(model, "model.safetensors");   // nanoGPT's names for a GPT
//   import_safetensors(model, "model.safetensors");   // into a model of the same config
//
// Names: a model of nanoGPT's architecture (standard blocks, softmax
// attention, learned positions) is written under the names of nanoGPT's GPT
// class ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
// "lm_head.weight", ...), its Linear weights transposed to PyTorch's
// [out, in]; with tied weights lm_head.weight is written too (a copy of
// wte), as nanoGPT's state_dict has it. Any other architecture is written
// under tapeformer's own parameter names and layouts. The model's config
// goes into the header's __metadata__ ("tapeformer_config").
#pragma once

#include <string>

#include "tapeformer/layers/transformer.h"

namespace tapeformer {

void export_safetensors(const LanguageModel& model, const std::string& path);
// Loads every parameter of `model` from `path` (written by
// export_safetensors, or by PyTorch from a matching nanoGPT GPT). The file is
// checked whole before anything is loaded, and refused naming the file and
// the tensor when its header is not JSON or names a tensor twice, byte ranges
// overlap or leave data bytes unclaimed, a tensor is missing, mis-shaped, not
// F32, unknown to the model or not finite, or a tied model's lm_head.weight
// differs from the embedding (it may be absent). nanoGPT's causal-mask
// buffers (transformer.h.N.attn.bias, 4-D) are skipped.
void import_safetensors(LanguageModel& model, const std::string& path);

}  // namespace tapeformer
