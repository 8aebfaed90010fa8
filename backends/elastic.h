// Elastic jobs, as the core and the public API see them (docs/elastic.md). The gloo transport
// implements them (backends/gloo/elastic_join.cc); a build without gloo has no elastic jobs
// (backends/elastic_unavailable.cc).
//
// The launcher (launcher/tuttirun_lib/elastic.py) publishes generations on its rendezvous
// server; the keys are its protocol with the workers:
//  1. "elastic/g<g>/seat/<worker>" = "<rank> <size>", or "none" for a worker that has no
//     place in generation g (it is being stopped). Written for every worker alive when g is
//     published.
//  2. then "elastic/published" (an ADD counter, i64) = g + 1.
//  3. A worker that took its seat in g sets "elastic/joined/<worker>" = "<g>": when a worker
//     exits 0, the launcher reads the generation it finished in, and stops the workers that
//     have not joined that one (replacements that can no longer finish).
//  A worker started for generation g (TUTTI_ELASTIC_GENERATION) first joins g or a later
//  one; a worker that ran in g joins only a later one.
//  From its first init on, a worker asks the server every second whether it is still there:
//  a server that has ended (tuttirun died without stopping the worker) stops the worker
//  (docs/elastic.md, "When tuttirun dies").
#pragma once

#include "backends/options.h"

#include <cstdint>

namespace tutti {

// Whether this process is a worker of an elastic job (TUTTI_ELASTIC_WORKER is set).
bool elasticJob();

// The generation this process joined last, -1 before its first init (or not elastic).
int64_t elasticJoinedGeneration();

// Whether this worker found its launcher's rendezvous server gone (tuttirun died): no failure
// is recoverable from then on (isRecoverable), as no launcher publishes a next world.
bool elasticLauncherGone();

// Whether the launcher has published a generation newer than the one this process joined
// (hosts were added or removed, or a worker failed). Asks the rendezvous server; throws
// Error(kUnsupported) outside an elastic job, Error(kTimeout/kBackend) when the server cannot
// be reached.
bool elasticHostsUpdated(const BackendOptions& options);

}  // namespace tutti
