// The settings every rank must give alike (AcrossRanks::kMustAgree in the config table:
// the response cache's capacity sizes the round's bit vector, the fusion threshold makes
// the fusion plan, autotune adds a broadcast to rounds), agreed once at init.
//
// At init, over the global set's control plane, before any backend is made:
//   1. every rank sends one line with its values ("TUTTI_CACHE_CAPACITY=1024 ...");
//   2. rank 0 broadcasts all the lines (exchangeLines), so every rank holds the same ones;
//   3. every rank computes the same verdict from them (settingsMismatch): on a mismatch init
//      fails on every rank with TUTTI_ERR_MISMATCH naming the variable, the ranks and both
//      values. No rank goes on to a round whose layout its peers do not share.
// Lines from other ranks are checked before use: a malformed one is an error naming its rank.
#pragma once

#include "backends/backend.h"
#include "core/config.h"

#include <string>
#include <vector>

namespace tutti {

// Pure: this rank's line, every kMustAgree variable as NAME=value, in table order.
std::string settingsLine(const Config& config);

// Pure: "" when every line gives the same values as rank 0's (lines[r] is rank r's), else
// the message, one clause per variable that differs: "TUTTI_CACHE_CAPACITY is 1000 on
// rank 1 but 1024 on rank 0 (set it the same on every rank; docs/env_vars.md)".
// A line that does not parse is reported as such, naming its rank.
std::string settingsMismatch(const std::vector<std::string>& lines);

// Collective over the global control plane (every rank, at init, steps 1-3). Throws
// Error(kMismatch) with settingsMismatch's message on every rank when they disagree.
void agreeSettings(const Config& config, ControlPlane& global, Deadline deadline);

}  // namespace tutti
