// `tapeformer kinds`: every family of named kinds a config selects from, each
// kind with its summary and the keys it declares (default and doc), read from
// the registries of this program, a user's registered kinds included.
//
//   tapeformer kinds              # plain text
//   tapeformer kinds --markdown   # docs/kinds.md (the ctest docs_kinds fails when that file drifts)
#pragma once

#include <string>

namespace tapeformer {

std::string kinds_listing(bool markdown);

}  // namespace tapeformer
