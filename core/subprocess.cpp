#include "tapeformer/core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <pthread.h>

#include "tapeformer/core/error.h"

extern char** environ;

namespace tapeformer {

namespace {

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// SIGPIPE blocked in this thread while it writes to the program's stdin: a
// program that exits early gives EPIPE, not the end of this process. A
// SIGPIPE raised meanwhile is taken off the pending set before unblocking.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlocked() {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{}, old_{};
};

}  // namespace

ProgramResult run_program(const std::vector<std::string>& argv, const std::string& input, size_t max_output) {
  TAPEFORMER_CHECK(!argv.empty() && !argv[0].empty(), "run_program: no program named");
  const std::string& name = argv[0];
  Fd in[2], out[2], err[2];  // [0] read end, [1] write end
  for (Fd* p : {in, out, err}) {
    int fds[2];
    TAPEFORMER_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "cannot run ", name, ": pipe: ", std::strerror(errno));
    p[0].fd = fds[0], p[1].fd = fds[1];
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 onto 0, 1, 2 clears close-on-exec there; every other pipe end closes at exec.
  posix_spawn_file_actions_adddup2(&actions, in[0].fd, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1].fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1].fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, name.c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  TAPEFORMER_CHECK(spawned != ENOENT, "cannot run ", name, ": not installed (no ", name, " on PATH)");
  TAPEFORMER_CHECK(spawned == 0, "cannot run ", name, ": ", std::strerror(spawned));
  in[0].close(), out[1].close(), err[1].close();

  ProgramResult r;
  std::string too_much;  // which stream overflowed, if one did
  {
    SigpipeBlocked blocked;
    for (Fd* f : {&in[1], &out[0], &err[0]}) ::fcntl(f->fd, F_SETFL, ::fcntl(f->fd, F_GETFL) | O_NONBLOCK);
    size_t written = 0;
    if (input.empty()) in[1].close();
    while (out[0].fd >= 0 || err[0].fd >= 0) {
      pollfd fds[3];
      nfds_t n = 0;
      for (Fd* f : {&in[1], &out[0], &err[0]})
        if (f->fd >= 0) fds[n++] = {f->fd, static_cast<short>(f == &in[1] ? POLLOUT : POLLIN), 0};
      if (::poll(fds, n, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (in[1].fd >= 0) {
        const ssize_t w = ::write(in[1].fd, input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in[1].close();  // EPIPE: it exited
      }
      struct Stream {
        Fd* f;
        std::string* text;
        const char* label;
      };
      for (const Stream& s : {Stream{&out[0], &r.out, "stdout"}, Stream{&err[0], &r.err, "stderr"}}) {
        Fd* f = s.f;
        std::string* text = s.text;
        const char* label = s.label;
        if (f->fd < 0) continue;
        char chunk[1 << 16];
        const ssize_t got = ::read(f->fd, chunk, sizeof chunk);
        if (got > 0 && text->size() + static_cast<size_t>(got) > max_output) too_much = label;
        if (got > 0 && too_much.empty()) text->append(chunk, static_cast<size_t>(got));
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR) || !too_much.empty()) f->close();
      }
      if (!too_much.empty()) break;
    }
    in[1].close(), out[0].close(), err[0].close();
  }
  if (!too_much.empty()) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  TAPEFORMER_CHECK(too_much.empty(), name, " wrote more than ", max_output, " bytes on ", too_much);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  return r;
}

}  // namespace tapeformer
