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
//
// SafetensorsLayout::hugging_face is transformers' GPT2LMHeadModel instead:
// the same names, but its Conv1D weights are [in, out] as tapeformer keeps
// them (only lm_head, a Linear, is [out, in]), the "transformer." prefix is optional on import
// (GPT2Model's files have none), and a tied head is not written (transformers
// ties it again when it loads) but accepted when equal to the embedding.
#pragma once

#include <string>

#include "tapeformer/layers/transformer.h"

namespace tapeformer {

enum class SafetensorsLayout { native, hugging_face };

void export_safetensors(const LanguageModel& model, const std::string& path,
                        SafetensorsLayout layout = SafetensorsLayout::native);
// Loads every parameter of `model` from `path` (written by
// export_safetensors, or by PyTorch from a matching nanoGPT GPT). The file is
// checked whole before anything is loaded, and refused naming the file and
// the tensor when its header is not JSON or names a tensor twice, byte ranges
// overlap or leave data bytes unclaimed, a tensor is missing, mis-shaped, not
// F32, unknown to the model or not finite, or a tied model's lm_head.weight
// differs from the embedding (it may be absent). nanoGPT's causal-mask
// buffers (transformer.h.N.attn.bias, 4-D) are skipped, and with the
// hugging_face layout transformers' h.N.attn.masked_bias too. hugging_face
// needs a model nanoGPT's names fit (is_gpt2_shaped).
void import_safetensors(LanguageModel& model, const std::string& path,
                        SafetensorsLayout layout = SafetensorsLayout::native);
// The same from a sharded checkpoint: its index (model.safetensors.index.json,
// {"weight_map": {tensor: shard file}}) and the shards beside it, each
// checked whole; a shard named by a path, a tensor in a shard the index does
// not give it, or one the index lists but its shard lacks, is refused.
void import_safetensors_shards(LanguageModel& model, const std::string& index_path,
                               SafetensorsLayout layout = SafetensorsLayout::native);

// Whether the model is GPT-2's architecture (nanoGPT's GPT): the transformer
// kind with standard blocks and MLP, softmax attention, learned positions and
// no memories. Its parameters have GPT-2's names.
bool is_gpt2_shaped(const LanguageModel& model);

}  // namespace tapeformer
