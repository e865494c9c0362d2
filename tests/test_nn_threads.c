/* test_nn_threads.c: the nn module's helpers that `train --workers` calls from one thread per
 * rank at once: a shape written for a message on one thread stays as written while another
 * thread writes its own shapes. */
#include "testutil.h"

#include <pthread.h>
#include <string.h>

#include "nn_impl.h"

/* Writes more shapes than the helper keeps at once, so that each of its buffers is written. */
static void *write_shapes(void *arg) {
    (void)arg;
    for (int i = 0; i < 16; i++) (void)nn_shape_str(shape3(i + 1, 2, 2));
    return NULL;
}

static void test_shape_str_per_thread(void **st) {
    (void)st;
    const char *mine = nn_shape_str(shape3(3, 8, 8));
    assert_string_equal(mine, "(3, 8, 8)");
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, write_shapes, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_string_equal(mine, "(3, 8, 8)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_str_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
