/*
 * Stand-in for MindCluster TaskD's libtaskd.so, for the launcher's tests.
 *
 * TaskD is proprietary and not installable; this stand-in implements the documented API surface and
 * records calls for tests. The only behaviour that matters here is being preloaded: the constructor
 * appends "<pid> <TASKD_PROCESS_ENABLE>\n" to $TASKD_STUB_DIR/preloaded (one O_APPEND write, so
 * concurrent ranks never interleave), proof that LD_PRELOAD and TASKD_PROCESS_ENABLE reached a
 * rank. Built by the tests: gcc -shared -fPIC -o taskd/python/cython_api/libs/libtaskd.so libtaskd.c
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void taskd_stub_preloaded(void)
{
    const char *dir = getenv("TASKD_STUB_DIR");
    const char *enable = getenv("TASKD_PROCESS_ENABLE");
    char path[4096];
    char line[256];
    int fd, len;

    if (dir == NULL || dir[0] == '\0')
        return;
    if (snprintf(path, sizeof(path), "%s/preloaded", dir) >= (int)sizeof(path))
        return;
    len = snprintf(line, sizeof(line), "%ld %s\n", (long)getpid(), enable ? enable : "(unset)");
    if (len <= 0 || len >= (int)sizeof(line))
        return;
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)len) < 0) {
        /* nothing to do: a test will notice the missing line */
    }
    close(fd);
}
