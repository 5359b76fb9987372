// A Ceilings entry as JSON, one writer for the ceilings cache (profile/ceilings.cpp) and the profile's JSON report
// (profile/report.cpp): both show the same fields, full precision and the method included. Internal to profile/.
#pragma once

#include <nlohmann/json.hpp>

#include "profile/ceilings.h"

namespace nt::profile {

nlohmann::ordered_json ceilings_json(const Ceilings& c);

}  // namespace nt::profile
