/* test_streams.c: the pure parts of resumable streams: server/stream_buf.c
 * (the replay buffer, stream ids, Last-Event-ID parsing), server/siphash.c
 * (the owner hash, against the reference vectors of the SipHash paper), and
 * the comparisons of the secrets a client presents (stream ids, API keys,
 * session ids). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>

#include "engine/include/engine.h"
#include "server/owner.h"
#include "server/router.h"
#include "server/siphash.h"
#include "server/stream_buf.h"
#include "test.h"

/* Pushes "data: <text>\n\n" and returns its index. */
static uint64_t push_text(struct stream_buf *b, const char *text)
{
    char frame[256];
    int n = snprintf(frame, sizeof frame, "data: %s\n\n", text);
    return stream_buf_push(b, frame, (size_t)n);
}

/* The concatenated frames of the undelivered events, delivering them. */
static void deliver_all(struct stream_buf *b, char *out, size_t cap)
{
    size_t o = 0;
    const struct stream_event *e;
    while ((e = stream_buf_next(b)) != NULL) {
        if (o + e->len < cap) {
            memcpy(out + o, e->data, e->len);
            o += e->len;
        }
        stream_buf_advance(b);
    }
    out[o] = 0;
}

TEST(stream_buf_numbers_events_from_one_and_frames_each_with_its_id)
{
    struct stream_buf b;
    stream_buf_init(&b);
    ASSERT_EQ(push_text(&b, "a"), 1);
    ASSERT_EQ(push_text(&b, "b"), 2);
    ASSERT_EQ(b.last, 2);
    char out[256];
    deliver_all(&b, out, sizeof out);
    ASSERT_STREQ(out, "id: 1\ndata: a\n\nid: 2\ndata: b\n\n");
    ASSERT_EQ(b.sent, 2);
    ASSERT_EQ(b.unsent_bytes, 0);
    ASSERT_EQ(b.bytes, strlen(out));
    stream_buf_free(&b);
}

TEST(stream_buf_rewind_replays_exactly_the_events_after_the_last_id)
{
    struct stream_buf b;
    stream_buf_init(&b);
    char text[16], out[1024];
    for (int i = 1; i <= 5; i++) {
        snprintf(text, sizeof text, "t%d", i);
        push_text(&b, text);
    }
    deliver_all(&b, out, sizeof out);
    ASSERT_OK(stream_buf_rewind(&b, 3));
    ASSERT_EQ(b.sent, 3);
    deliver_all(&b, out, sizeof out);
    ASSERT_STREQ(out, "id: 4\ndata: t4\n\nid: 5\ndata: t5\n\n");
    ASSERT_OK(stream_buf_rewind(&b, 0)); /* from the start */
    deliver_all(&b, out, sizeof out);
    ASSERT(strncmp(out, "id: 1\ndata: t1\n\nid: 2\n", 22) == 0);
    ASSERT_OK(stream_buf_rewind(&b, 5)); /* everything: nothing to send */
    ASSERT(stream_buf_next(&b) == NULL);
    ASSERT_EQ(b.unsent_bytes, 0);
    ASSERT_EQ(stream_buf_rewind(&b, 6), -ERANGE);
    ASSERT_EQ(stream_buf_rewind(&b, UINT64_MAX), -ERANGE);
    stream_buf_free(&b);
}

TEST(stream_buf_trim_drops_only_delivered_events_oldest_first)
{
    struct stream_buf b;
    stream_buf_init(&b);
    for (int i = 0; i < 10; i++)
        push_text(&b, "0123456789"); /* each frame: "id: N\n" + 18 bytes */
    size_t all = b.bytes;
    ASSERT_EQ(stream_buf_trim(&b, 0), 0); /* nothing delivered: nothing may go */
    ASSERT_EQ(b.bytes, all);
    for (int i = 0; i < 4; i++)
        stream_buf_advance(&b);
    size_t freed = stream_buf_trim(&b, 0);
    ASSERT_EQ(freed, 4 * (6 + 18));
    ASSERT_EQ(b.head->index, 5);
    ASSERT_EQ(b.bytes, all - freed);
    ASSERT_EQ(b.unsent_bytes, b.bytes);
    ASSERT_EQ(stream_buf_oldest_resumable(&b), 4);
    /* a client older than what is kept: gone, and the cursor does not move */
    ASSERT_EQ(stream_buf_rewind(&b, 3), -ESTALE);
    ASSERT_EQ(stream_buf_next(&b)->index, 5);
    ASSERT_OK(stream_buf_rewind(&b, 4));
    /* trim stops at max */
    for (int i = 0; i < 6; i++)
        stream_buf_advance(&b);
    ASSERT(stream_buf_next(&b) == NULL);
    stream_buf_trim(&b, 2 * 24 + 1);
    ASSERT_EQ(b.head->index, 9); /* 9 and 10 (25 bytes each) fit in 49 */
    stream_buf_trim(&b, 0);
    ASSERT(b.head == NULL && b.tail == NULL && b.bytes == 0);
    ASSERT_EQ(stream_buf_oldest_resumable(&b), 10);
    ASSERT_OK(stream_buf_rewind(&b, 10)); /* the client has it all */
    ASSERT_EQ(stream_buf_rewind(&b, 9), -ESTALE);
    ASSERT_EQ(push_text(&b, "more"), 11); /* numbering goes on */
    ASSERT_EQ(stream_buf_next(&b)->index, 11);
    stream_buf_free(&b);
}

TEST(stream_ids_are_32_lowercase_hex_characters)
{
    unsigned char rnd[16];
    for (int i = 0; i < 16; i++)
        rnd[i] = (unsigned char)(i * 17 + 1);
    char id[STREAM_ID_LEN + 1];
    stream_id_format(id, rnd);
    ASSERT_STREQ(id, "0112233445566778899aabbccddeef00"); /* 15 * 17 + 1 wraps to 0 */
    ASSERT(stream_id_valid(id, strlen(id)));
    ASSERT(!stream_id_valid(id, 31));
    ASSERT(!stream_id_valid("0112233445566778899aabbccddeeff00", 33));
    ASSERT(!stream_id_valid("0112233445566778899AABBCCDDEEFF0", 32));
    ASSERT(!stream_id_valid("0112233445566778899aabbccddeeffg", 32));
    ASSERT(!stream_id_valid("../../../../../../../../etc/pass", 32));
    ASSERT(!stream_id_valid("0112233445566778899aabbccddeef%00", 32));
    ASSERT(!stream_id_valid("", 0));
    char nul[32];
    memcpy(nul, id, 32);
    nul[5] = 0;
    ASSERT(!stream_id_valid(nul, 32));
}

TEST(stream_ids_compare_equal_only_when_every_character_is)
{
    ASSERT(stream_id_equal("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"));
    ASSERT(
        !stream_id_equal("0123456789abcdef0123456789abcdef", "1123456789abcdef0123456789abcdef"));
    ASSERT(
        !stream_id_equal("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdee"));
    ASSERT(
        !stream_id_equal("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcde\0"));
}

/* The key index of "Authorization: <auth>" on a server with keys k[0..n-1]. */
static int key_index(const char *const *k, size_t n, const char *auth)
{
    struct server *s = calloc(1, sizeof *s);
    struct http_conn *c = calloc(1, sizeof *c);
    if (!s || !c) {
        free(s);
        free(c);
        return -99; /* no memory: matches no expectation */
    }
    for (size_t i = 0; i < n; i++)
        s->keys[i] = (char *)k[i];
    s->n_keys = n;
    snprintf(c->req.authorization, sizeof c->req.authorization, "%s", auth);
    int idx = router_key_index(s, c);
    free(s);
    free(c);
    return idx;
}

TEST(api_keys_match_only_in_full_whatever_their_place_and_length)
{
    const char *k[] = {"sk-alpha-0001", "sk-beta", "sk-alpha-0002"};
    ASSERT_EQ(key_index(k, 3, "Bearer sk-alpha-0001"), 0);
    ASSERT_EQ(key_index(k, 3, "Bearer sk-beta"), 1);
    ASSERT_EQ(key_index(k, 3, "Bearer sk-alpha-0002"), 2);
    ASSERT_EQ(key_index(k, 3, "bearer   sk-beta \t"), 1);
    ASSERT_EQ(key_index(k, 3, "Bearer sk-alpha-000"), -2);   /* a prefix */
    ASSERT_EQ(key_index(k, 3, "Bearer sk-alpha-00011"), -2); /* one more character */
    ASSERT_EQ(key_index(k, 3, "Bearer sk-alpha-0003"), -2);  /* the last one differs */
    ASSERT_EQ(key_index(k, 3, "Bearer tk-alpha-0001"), -2);  /* the first one differs */
    ASSERT_EQ(key_index(k, 3, "Bearer "), -2);
    ASSERT_EQ(key_index(k, 3, "sk-beta"), -2);        /* not a bearer token */
    ASSERT_EQ(key_index(k, 0, "Bearer sk-beta"), -1); /* an open server */
}

TEST(session_ids_compare_equal_only_when_every_character_and_the_length_are)
{
    ASSERT(engine_session_id_equal("sess_0123", "sess_0123"));
    ASSERT(engine_session_id_equal("a", "a"));
    ASSERT(!engine_session_id_equal("sess_0123", "tess_0123"));
    ASSERT(!engine_session_id_equal("sess_0123", "sess_0124"));
    ASSERT(!engine_session_id_equal("sess_0123", "sess_012"));
    ASSERT(!engine_session_id_equal("sess_012", "sess_0123"));
    ASSERT(!engine_session_id_equal("", "a"));
    ASSERT(engine_session_id_equal("", ""));
    /* the longest ids, and buffers with bytes after their end that differ */
    char a[ENGINE_SESSION_ID_MAX], b[ENGINE_SESSION_ID_MAX];
    memset(a, 'x', sizeof a);
    memset(b, 'x', sizeof b);
    a[ENGINE_SESSION_ID_MAX - 1] = b[ENGINE_SESSION_ID_MAX - 1] = 0;
    ASSERT(engine_session_id_equal(a, b));
    b[ENGINE_SESSION_ID_MAX - 2] = 'y';
    ASSERT(!engine_session_id_equal(a, b));
    b[ENGINE_SESSION_ID_MAX - 2] = 'x';
    a[3] = b[3] = 0;
    a[5] = 'p';
    b[5] = 'q';
    ASSERT(engine_session_id_equal(a, b)); /* "xxx" both */
}

TEST(last_event_id_parses_decimal_numbers_and_nothing_else)
{
    uint64_t v = 99;
    ASSERT_OK(stream_event_id_parse("17", 2, &v));
    ASSERT_EQ(v, 17);
    ASSERT_OK(stream_event_id_parse(" 5\t", 3, &v));
    ASSERT_EQ(v, 5);
    ASSERT_OK(stream_event_id_parse("", 0, &v)); /* empty: none (EventSource) */
    ASSERT_EQ(v, 0);
    ASSERT_OK(stream_event_id_parse("  ", 2, &v));
    ASSERT_EQ(v, 0);
    ASSERT_OK(stream_event_id_parse("18446744073709551615", 20, &v));
    ASSERT(v == UINT64_MAX);
    const char *bad[] = {"-1",
                         "+1",
                         "abc",
                         "1e3",
                         "0x10",
                         "1 2",
                         "18446744073709551616",
                         "999999999999999999999999",
                         "3.0",
                         "١",
                         "7a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (stream_event_id_parse(bad[i], strlen(bad[i]), &v) != -EINVAL)
            FAIL_AT("'%s' was accepted as %llu", bad[i], (unsigned long long)v);
    }
}

/* The SipHash paper, appendix A: key 00..0f, messages 00, 00 01, ... */
TEST(siphash24_matches_the_reference_vectors)
{
    unsigned char key[16], msg[64];
    for (int i = 0; i < 16; i++)
        key[i] = (unsigned char)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (unsigned char)i;
    ASSERT(siphash24(key, msg, 0) == 0x726fdb47dd0e0e31ull);
    ASSERT(siphash24(key, msg, 15) == 0xa129ca6149be45e5ull);
    /* another key or message: another value */
    ASSERT(siphash24(key, "sk-one", 6) != siphash24(key, "sk-two", 6));
    key[0] ^= 1;
    ASSERT(siphash24(key, msg, 15) != 0xa129ca6149be45e5ull);
}

/* The group of an address under --max-detached on an open server. */
static uint64_t group_of_text(const char *addr)
{
    static const unsigned char key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
    if (inet_pton(AF_INET, addr, &v4.sin_addr) == 1)
        return owner_group_of_address(key, (const struct sockaddr *)&v4);
    if (inet_pton(AF_INET6, addr, &v6.sin6_addr) != 1)
        abort();
    return owner_group_of_address(key, (const struct sockaddr *)&v6);
}

/* One IPv6 host may hold a whole /64 and use a fresh address per
 * connection: its streams count as one client. IPv4 clients stay apart, also
 * behind a dual-stack listener (IPv4-mapped), where a /64 would put every
 * IPv4 client in one group. */
TEST(streams_group_an_ipv6_client_by_its_64_and_ipv4_by_address)
{
    ASSERT(group_of_text("2001:db8:1:2::1") == group_of_text("2001:db8:1:2:ffff:abcd:1234:5"));
    ASSERT(group_of_text("2001:db8:1:2::1") != group_of_text("2001:db8:1:3::1"));
    ASSERT(group_of_text("2001:db8:1:2::1") != group_of_text("2001:db9:1:2::1"));
    ASSERT(group_of_text("192.0.2.1") != group_of_text("192.0.2.2"));
    ASSERT(group_of_text("::ffff:192.0.2.1") == group_of_text("192.0.2.1"));
    ASSERT(group_of_text("::ffff:192.0.2.1") != group_of_text("::ffff:192.0.2.2"));
    struct sockaddr other = {.sa_family = AF_UNIX};
    static const unsigned char key[16] = {0};
    ASSERT(owner_group_of_address(key, &other) == 0);
}

TEST_MAIN()
