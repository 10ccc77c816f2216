// nanoGPT's meta.pkl: the vocabulary beside a char-level train.bin / val.bin.
//
//   std::unique_ptr<Tokenizer> tok = read_nanogpt_meta("data/shakespeare_char/meta.pkl");
//
// nanoGPT's data/*_char/prepare.py pickles {'vocab_size': n, 'itos': {id: ch},
// 'stoi': {ch: id}} with chars = sorted(set(text)): ids are the ranks of the
// characters in code point order, which is exactly a CharTokenizer's
// vocabulary. This reads that file without Python: a pickle machine for the
// opcodes such a dict of ints and strings is written with (protocols 2 to 5),
// refusing anything else (lists, objects, code) with an Error naming the
// opcode and its offset, so an untrusted file can never run code.
#pragma once

#include <memory>
#include <string>

#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

// The char tokenizer meta['itos'] describes. Error naming the path when the
// file is missing, truncated, not such a pickle, or its itos is not one
// character per id 0..n-1 in code point order (or disagrees with vocab_size).
std::unique_ptr<Tokenizer> read_nanogpt_meta(const std::string& path);

}  // namespace tapeformer
