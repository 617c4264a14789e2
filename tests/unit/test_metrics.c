/* test_metrics.c: server/metrics.c histograms and the Prometheus text. */
#include "server/metrics.h"
#include "test.h"

TEST(metrics_histogram_buckets_are_cumulative_in_the_text)
{
    struct metrics m;
    metrics_init(&m);
    metrics_hist_observe(&m.ttft, 0.003); /* <= 0.005 */
    metrics_hist_observe(&m.ttft, 0.2);   /* <= 0.25 */
    metrics_hist_observe(&m.ttft, 500);   /* +Inf */
    char buf[16384];
    size_t n = metrics_render(&m, NULL, NULL, NULL, buf, sizeof buf);
    ASSERT(n < sizeof buf);
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n"));
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"));
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_bucket{le=\"120\"} 2\n"));
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
    ASSERT(strstr(buf, "streamsink_time_to_first_token_seconds_count 3\n"));
    ASSERT(strstr(buf, "# TYPE streamsink_time_to_first_token_seconds histogram\n"));
}

TEST(metrics_counts_requests_by_endpoint_and_status)
{
    struct metrics m;
    metrics_init(&m);
    metrics_count_request(&m, METRICS_EP_CHAT, 200);
    metrics_count_request(&m, METRICS_EP_CHAT, 200);
    metrics_count_request(&m, METRICS_EP_COMPLETIONS, 429);
    metrics_count_request(&m, METRICS_EP_OTHER, 418);
    char buf[16384];
    metrics_render(&m, NULL, NULL, NULL, buf, sizeof buf);
    ASSERT(strstr(buf, "streamsink_requests_total{endpoint=\"/v1/chat/completions\","
                       "status=\"200\"} 2\n"));
    ASSERT(strstr(buf, "streamsink_requests_total{endpoint=\"/v1/completions\","
                       "status=\"429\"} 1\n"));
    ASSERT(strstr(buf, "streamsink_requests_total{endpoint=\"other\",status=\"other\"} 1\n"));
}

TEST(metrics_renders_engine_and_live_gauges_and_escapes_labels)
{
    struct metrics m;
    metrics_init(&m);
    struct metrics_live live = {.conns_open = 3, .write_queue_bytes = 1234, .high_water = 65536};
    struct engine_stats es = {.active_seqs = 2,
                              .paused_seqs = 1,
                              .slots_total = 8,
                              .slots_free = 6,
                              .evicted_tokens_total = 77 + 5,
                              .evicted_window_total = 5,
                              .healthy = 1};
    es.evicted_sinks_total[4] = 77;
    struct engine_model_info mi = {.name = "we\"ird\\name", .default_policy = "sinks:4"};
    char buf[16384];
    size_t n = metrics_render(&m, &live, &es, &mi, buf, sizeof buf);
    ASSERT(n < sizeof buf);
    ASSERT(strstr(buf, "streamsink_connections_open 3\n"));
    ASSERT(strstr(buf, "streamsink_write_queue_bytes 1234\n"));
    ASSERT(strstr(buf, "streamsink_paused_sequences 1\n"));
    ASSERT(strstr(buf, "streamsink_kv_slots_used 2\n"));
    ASSERT(strstr(buf, "streamsink_kv_evicted_tokens_total{policy=\"sinks:4\"} 77\n"));
    ASSERT(strstr(buf, "streamsink_kv_evicted_tokens_total{policy=\"window\"} 5\n"));
    ASSERT(!strstr(buf, "policy=\"sinks:0\""));
    ASSERT(strstr(buf, "name=\"we\\\"ird\\\\name\""));
}

TEST(metrics_renders_the_default_policy_s_eviction_series_for_dense_too)
{
    struct metrics m;
    metrics_init(&m);
    struct engine_stats es = {.healthy = 1};
    struct engine_model_info mi = {.name = "m", .default_policy = "dense"};
    char buf[16384];
    ASSERT(metrics_render(&m, NULL, &es, &mi, buf, sizeof buf) < sizeof buf);
    ASSERT(strstr(buf, "streamsink_kv_evicted_tokens_total{policy=\"dense\"} 0\n"));
}

TEST(metrics_render_reports_the_size_it_needs)
{
    struct metrics m;
    metrics_init(&m);
    char small[64];
    size_t need = metrics_render(&m, NULL, NULL, NULL, small, sizeof small);
    ASSERT(need > sizeof small);
    char *big = malloc(need + 1);
    ASSERT_EQ(metrics_render(&m, NULL, NULL, NULL, big, need + 1), need);
    ASSERT_EQ(strlen(big), need);
    free(big);
}

TEST_MAIN()
