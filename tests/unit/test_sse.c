/* test_sse.c: server/sse.c framing, byte for byte, without sockets. */
#include "server/sse.h"
#include "test.h"

TEST(sse_frames_one_json_line_as_one_data_line)
{
    char buf[128];
    const char *json = "{\"a\":1}";
    size_t n = sse_frame_data(buf, sizeof buf, json, strlen(json));
    ASSERT_EQ(n, strlen("data: {\"a\":1}\n\n"));
    buf[n] = 0;
    ASSERT_STREQ(buf, "data: {\"a\":1}\n\n");
}

TEST(sse_splits_every_kind_of_line_break_into_data_lines)
{
    char buf[128];
    const char *text = "a\nb\r\nc\rd";
    size_t n = sse_frame_data(buf, sizeof buf, text, strlen(text));
    buf[n] = 0;
    ASSERT_STREQ(buf, "data: a\ndata: b\ndata: c\ndata: d\n\n");
}

TEST(sse_frames_an_empty_payload_as_an_empty_data_line)
{
    char buf[16];
    size_t n = sse_frame_data(buf, sizeof buf, "", 0);
    buf[n] = 0;
    ASSERT_STREQ(buf, "data: \n\n");
}

TEST(sse_reports_the_size_it_needs_and_writes_nothing_when_short)
{
    char buf[8];
    memset(buf, '#', sizeof buf);
    size_t n = sse_frame_data(buf, sizeof buf, "hello world", 11);
    ASSERT_EQ(n, strlen("data: hello world\n\n"));
    ASSERT_EQ(buf[0], '#');
    char exact[19];
    ASSERT_EQ(sse_frame_data(exact, sizeof exact, "hello world", 11), 19);
    ASSERT(memcmp(exact, "data: hello world\n\n", 19) == 0);
}

TEST(sse_writes_done_and_comments)
{
    char buf[64];
    size_t n = sse_frame_done(buf, sizeof buf);
    buf[n] = 0;
    ASSERT_STREQ(buf, "data: [DONE]\n\n");
    n = sse_frame_comment(buf, sizeof buf, "keep-alive");
    buf[n] = 0;
    ASSERT_STREQ(buf, ": keep-alive\n\n");
    n = sse_frame_comment(buf, sizeof buf, "one\ntwo"); /* a comment is one line */
    buf[n] = 0;
    ASSERT_STREQ(buf, ": one\n\n");
}

TEST_MAIN()
