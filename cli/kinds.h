// `tapeformer kinds`: every family of named kinds a config selects from, each
// kind with its summary and the keys it declares (default and doc), read from
// the registries of this program, a user's registered kinds included.
//
//   tapeformer kinds              # plain text
//   tapeformer kinds --markdown   # docs/kinds.md (the ctest docs_kinds fails when that file drifts)
//   tapeformer kinds --readme     # README.md's tables of the model families, between its markers
//   tapeformer kinds --json       # [{key, prefix, default, kinds: [{name, summary, options: [{name, default, small?}]}]}]
#pragma once

#include <string>

namespace tapeformer {

std::string kinds_listing(bool markdown);

// Every family as JSON, for scripts: each kind's name, summary and declared
// options with their defaults and the small values whole-model tests use.
std::string kinds_json();

// The tables of model.attention, model.positional, model.block and
// model.mlp (kind, summary, keys), between the marker lines below.
std::string kinds_readme();
extern const char* const kReadmeBegin;
extern const char* const kReadmeEnd;

}  // namespace tapeformer
