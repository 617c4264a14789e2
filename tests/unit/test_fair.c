/*
 * test_fair.c: server/fair.c, the queue that decides which client's prompt
 * gets a tokenizer worker next: a flood from one client against another
 * client's one job, and random pushes, takes and ends held to the
 * properties the router relies on, checked by brute force over a log of
 * what happened: a group's jobs start in the order pushed, no worker idles
 * while a job waits, and while a job waits no other group starts more than
 * two jobs more than the jobs of its own group that were waiting ahead of
 * it. A backlogged group is not starved by another that sends one job at a
 * time, equal tags go in the order pushed, and a job whose client left
 * leaves the queue.
 */
#include <stdlib.h>
#include <string.h>

#include "server/fair.h"
#include "test.h"

/* Group 1 queues twelve jobs, then groups 2 and 3 one each: with four
 * workers busy with group 1, 2 and 3 start at the next two free workers,
 * not after group 1's twelve; with one worker, after one more of group 1's
 * at most. */
TEST(a_client_with_many_jobs_waiting_does_not_hold_the_others_behind_them)
{
    for (int workers = 1; workers <= 4; workers += 3) {
        struct fair_queue q;
        fair_init(&q, workers);
        struct fair_job jobs[14] = {0};
        for (int i = 0; i < 12; i++) {
            jobs[i].group = 1;
            fair_push(&q, &jobs[i]);
        }
        for (int i = 0; i < workers; i++)
            ASSERT(fair_take(&q) == &jobs[i]); /* nobody else waited */
        ASSERT(fair_take(&q) == NULL);         /* every worker taken */
        jobs[12].group = 2;
        jobs[13].group = 3;
        fair_push(&q, &jobs[12]);
        fair_push(&q, &jobs[13]);
        int seen2 = -1, seen3 = -1;
        for (int k = 0; k < 12 - workers + 2; k++) {
            fair_done(&q);
            struct fair_job *j = fair_take(&q);
            ASSERT(j != NULL);
            if (j == &jobs[12])
                seen2 = k;
            if (j == &jobs[13])
                seen3 = k;
        }
        ASSERT(seen2 >= 0 && seen2 <= 1);
        ASSERT(seen3 >= 0 && seen3 <= 2);
    }
}

/* Random pushes, takes and ends (groups 0..4, 3 workers), checked against
 * the log. */
TEST(fair_take_keeps_each_group_s_order_idles_no_worker_and_serves_groups_in_turn)
{
    enum { N = 3000, G = 5, W = 3 };
    static struct fair_job jobs[N];
    static int64_t pushed_at[N], taken_at[N], ahead[N]; /* event times; jobs of its group
                                                           waiting when it was pushed */
    static int seq_of[N];                               /* its number within its group */
    int n_push = 0, n_run = 0, count[G] = {0};
    int64_t now = 0;
    struct fair_queue q;
    fair_init(&q, W);
    srand(11);
    for (int i = 0; i < N; i++)
        taken_at[i] = -1;
    int n_taken = 0;
    while (n_taken < N || n_run > 0) {
        int what = rand() % 3;
        now++;
        if (what == 0 && n_push < N) {
            int g = rand() % (rand() % 4 == 0 ? G : 2); /* groups 0, 1 push most */
            jobs[n_push].group = (uint64_t)g;
            int64_t waiting = 0;
            for (int i = 0; i < n_push; i++)
                waiting += jobs[i].group == (uint64_t)g && taken_at[i] < 0;
            ahead[n_push] = waiting;
            seq_of[n_push] = count[g]++;
            pushed_at[n_push] = now;
            fair_push(&q, &jobs[n_push++]);
        } else if (what == 1) {
            int64_t waiting = 0;
            for (int i = 0; i < n_push; i++)
                waiting += taken_at[i] < 0;
            struct fair_job *j = fair_take(&q);
            ASSERT((j != NULL) == (waiting > 0 && n_run < W)); /* work-conserving */
            if (j) {
                taken_at[j - jobs] = now;
                n_run++;
                n_taken++;
            }
        } else if (n_run > 0) {
            fair_done(&q);
            n_run--;
        }
    }
    for (int a = 0; a < N; a++) {
        ASSERT(taken_at[a] >= 0);
        /* the group's order */
        for (int b = 0; b < N; b++)
            if (jobs[b].group == jobs[a].group && seq_of[b] < seq_of[a])
                ASSERT(taken_at[b] < taken_at[a]);
        /* while a waited, each other group started at most ahead + 2 jobs */
        int64_t started[G] = {0};
        for (int b = 0; b < N; b++)
            if (jobs[b].group != jobs[a].group && taken_at[b] > pushed_at[a] &&
                taken_at[b] < taken_at[a])
                started[jobs[b].group]++;
        for (int g = 0; g < G; g++)
            ASSERT(started[g] <= ahead[a] + 2);
    }
}

/* One worker; group 1 has ten jobs waiting while group 2 sends its next
 * job only when it has none waiting: group 1 still gets every other start
 * (a queue that forgot what it had started would give group 2 them all). */
TEST(a_backlogged_group_is_not_starved_by_one_that_sends_a_job_at_a_time)
{
    struct fair_queue q;
    fair_init(&q, 1);
    static struct fair_job g1[10], g2[1000];
    for (int i = 0; i < 10; i++) {
        g1[i].group = 1;
        fair_push(&q, &g1[i]);
    }
    int started1 = 0, sent2 = 0, waiting2 = 0;
    for (int i = 0; i < 1000; i++) {
        if (!waiting2) {
            g2[sent2].group = 2;
            fair_push(&q, &g2[sent2++]);
            waiting2 = 1;
        }
        struct fair_job *j = fair_take(&q);
        ASSERT(j != NULL);
        waiting2 &= j->group != 2;
        started1 += j->group == 1;
        if (j->group == 1)
            ASSERT(j == &g1[started1 - 1]); /* in its order */
        fair_done(&q);
        if (i == 25)
            ASSERT_EQ(started1, 10); /* turn and turn about */
    }
}

/* Equal tags go in the order pushed; a removed job is never taken. */
TEST(equal_tags_go_in_the_order_pushed_and_a_removed_job_leaves)
{
    struct fair_queue q;
    fair_init(&q, 1);
    struct fair_job a = {.group = 1}, b = {.group = 2}, c = {.group = 3}, d = {.group = 3};
    fair_push(&q, &a);
    fair_push(&q, &b);
    fair_push(&q, &c);
    fair_push(&q, &d);
    ASSERT_EQ(a.tag, b.tag);
    ASSERT_EQ(b.tag, c.tag);
    fair_remove(&q, &b);
    ASSERT(fair_take(&q) == &a);
    fair_done(&q);
    ASSERT(fair_take(&q) == &c);
    fair_done(&q);
    fair_remove(&q, &d); /* the last: the queue is empty, and takes new jobs */
    ASSERT(fair_take(&q) == NULL);
    fair_push(&q, &b);
    ASSERT(fair_take(&q) == &b);
}

/* A job of several texts costs each: another group's jobs of one text,
 * pushed after it, start first until they have had as much. */
TEST(a_job_of_several_texts_waits_its_cost)
{
    struct fair_queue q;
    fair_init(&q, 1);
    struct fair_job a = {.group = 1, .cost = 3}, b1 = {.group = 2}, b2 = {.group = 2},
                    b3 = {.group = 2};
    fair_push(&q, &a);
    fair_push(&q, &b1);
    fair_push(&q, &b2);
    fair_push(&q, &b3);
    const struct fair_job *want[4] = {&b1, &b2, &a, &b3}; /* a and b3 tie: pushed first */
    for (int i = 0; i < 4; i++) {
        ASSERT(fair_take(&q) == want[i]);
        fair_done(&q);
    }
}

TEST(the_pool_size_is_libuv_s)
{
    unsetenv("UV_THREADPOOL_SIZE");
    ASSERT_EQ(fair_pool_workers(), 4);
    setenv("UV_THREADPOOL_SIZE", "9", 1);
    ASSERT_EQ(fair_pool_workers(), 9);
    setenv("UV_THREADPOOL_SIZE", "0", 1);
    ASSERT_EQ(fair_pool_workers(), 1);
    setenv("UV_THREADPOOL_SIZE", "5000", 1);
    ASSERT_EQ(fair_pool_workers(), 1024);
    setenv("UV_THREADPOOL_SIZE", "-1", 1); /* libuv reads it as unsigned */
    ASSERT_EQ(fair_pool_workers(), 1024);
    unsetenv("UV_THREADPOOL_SIZE");
}

TEST_MAIN()
