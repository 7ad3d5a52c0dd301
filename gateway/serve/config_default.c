/*
 * The embedded default config: what `infergate serve` runs with no --config.
 * One region "local" on 127.0.0.1:8080, one model "tiny" generated from the
 * mkmodel preset "tiny" into the cache directory (@cache: see
 * ig_config_cache_dir), one CPU pool with one instance. It must stay in step
 * with config/local.json, which spells out the same setup as a file.
 */
#include "infergate/config.h"

const char ig_config_default_json[] =
    "{\n"
    "  \"region\": \"local\",\n"
    "  \"listen\": \"127.0.0.1:8080\",\n"
    "  \"models\": [\n"
    "    {\"name\": \"tiny\", \"path\": \"@cache/models/tiny\", \"preset\": \"tiny\"}\n"
    "  ],\n"
    "  \"pools\": [\n"
    "    {\"name\": \"local-cpu\", \"model\": \"tiny\", \"devices\": [\"cpu\"],\n"
    "     \"min_instances\": 1, \"max_instances\": 1}\n"
    "  ]\n"
    "}\n";
