#ifndef INFERGATE_GATEWAY_INTERNAL_H
#define INFERGATE_GATEWAY_INTERNAL_H

/*
 * What gateway.c (composition, the OpenAI endpoints) and status.c (the
 * /load, /status and /v1/models documents) share. Private to serve/.
 */

#include "infergate/gateway.h"
#include "infergate/metrics.h"
#include "infergate/scaler.h"
#include "infergate/chat.h"
#include "infergate/tokenizer.h"

/* A local model's tokenizer, so that the gateway hashes a prompt's blocks as
 * its workers will cache them (docs/routing.md, "Prefix-aware routing"). */
typedef struct {
    const char *model; /* borrowed from the config */
    ig_tokenizer_t *tok;
    ig_chat_style_t style;
    int block_size; /* its pool's */
} gw_prefix_model_t;

struct ig_gateway_s {
    uv_loop_t *loop;
    const ig_config_t *cfg;
    char region[64]; /* sanitised: it goes into a header */
    char run_dir[512];
    int own_run_dir;
    ig_pool_t **pools;
    int npools;
    ig_site_t **sites;
    int nsites;
    ig_proxy_t *proxy;
    ig_scaler_t *scaler; /* NULL from ig_gateway_close on */
    int pending_closes;
    void (*close_cb)(void *data);
    void *close_data;
    ig_metric_t *m_instances;
    gw_prefix_model_t *pmodels;
    int npmodels;
};

/* 1 when the model is served by a pool or named by a site. */
int ig__gateway_model_known(ig_gateway_t *gw, const char *model);

#endif
