// Hugging Face GPT-2 checkpoints: a directory as transformers'
// save_pretrained writes it, read into a tapeformer run and written back.
//
//   HfGpt2 hf = read_hf_gpt2("gpt2");        // config.json, model.safetensors, the tokenizer files
//   write_imported_run(hf, "out/gpt2");       // checkpoint.bin at step 0: train --resume, eval, sample, export
//   write_hf_gpt2(*loaded.model, *loaded.tokenizer, "out/hf");   // the reverse
//
// config.json -> model.*: n_layer, n_head, n_embd; n_positions -> block_size
// (learned positions); vocab_size; layer_norm_epsilon -> norm_eps;
// activation_function "gelu_new" or "gelu_pytorch_tanh" -> gelu (the tanh
// form), "relu" and "silu" too; tie_word_embeddings -> tie_weights;
// resid_pdrop -> dropout; biases always (GPT-2 has them). The weights are
// GPT-2's Conv1D layout, [in, out], which is tapeformer's (export.h's
// SafetensorsLayout::hugging_face). Refused naming the field: another
// model_type, the erf GELU ("gelu"), an n_inner other than 4 n_embd,
// scale_attn_weights false, scale_attn_by_inverse_layer_idx, cross
// attention; a directory with only pytorch_model.bin (a pickle, which can
// run code when read), or with shards but no index; a tokenizer whose size
// is not vocab_size. A sharded checkpoint reads through its index
// (model.safetensors.index.json).
#pragma once

#include <memory>
#include <string>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/config.h"

namespace tapeformer {

struct HfGpt2 {
  TrainConfig cfg;                       // model.* from config.json, data.tokenizer "byte_bpe"; the rest defaults
  std::unique_ptr<Tokenizer> tokenizer;  // byte_bpe, from the directory's tokenizer files
  std::unique_ptr<LanguageModel> model;  // the weights of model.safetensors
};

// config.json's text -> the model config (what the header describes).
ModelConfig model_config_of_hf(const std::string& config_json, const std::string& origin);
// The model config -> config.json's text; Error naming the kind GPT-2 cannot express.
std::string hf_config_of_model(const LanguageModel& model, const Tokenizer* tokenizer);

// With block_size > 0 (at most n_positions), the position table is cut to its
// first block_size rows and model.block_size set to it (nanoGPT's
// crop_block_size): a 1024-position GPT-2 fine-tuned on 256-token windows.
HfGpt2 read_hf_gpt2(const std::string& dir, int64_t block_size = 0);
// A run directory holding the imported model at step 0 (created; refused
// when it already holds a checkpoint).
void write_imported_run(const HfGpt2& hf, const std::string& out_dir);
// config.json, model.safetensors, generation_config.json and, for a byte_bpe
// tokenizer, vocab.json, merges.txt, tokenizer.json, tokenizer_config.json and
// special_tokens_map.json (for a char tokenizer: a tokenizer.json of one
// token per character, tokenizers' WordLevel) into dir (created). Refuses a model that is not
// GPT-2's architecture or a tokenizer transformers could not load, naming it.
void write_hf_gpt2(const LanguageModel& model, const Tokenizer& tokenizer, const std::string& dir);

}  // namespace tapeformer
