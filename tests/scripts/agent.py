"""An agent process for the coherence tests: it runs under its own uid (setpriv)
and obeys one command a line on stdin, answering one line on stdout.

  open PATH r|w|wn     open for reading, writing (O_TRUNC) or writing O_NONBLOCK
  read                 the whole content of the open file, as hex
  write HEX            write bytes at the current offset
  fsync
  poll MS              wait up to MS for POLLPRI on the open file: "pri" or "none"
  state PATH           user.memos.state of PATH
  ack PATH             setfattr user.memos.ack
  ioctlack             ioctl(fd, MEMOS_IOC_ACK) on the open file
  close
Errors answer "err ERRNO-NAME".  Stdlib only.
"""
import errno
import fcntl
import os
import select
import sys

fd = None
MEMOS_IOC_ACK = 0x4D01          # memosfs.shared.MEMOS_IOC_ACK, _IO('M', 1)


def answer(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    cmd, *args = line.split()
    try:
        if cmd == "open":
            flags = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     "wn": os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK}[args[1]]
            fd = os.open(args[0], flags, 0o666)
            answer("ok")
        elif cmd == "read":
            os.lseek(fd, 0, os.SEEK_SET)
            out = b""
            while chunk := os.read(fd, 1 << 20):
                out += chunk
            answer(out.hex() or "-")
        elif cmd == "write":
            os.write(fd, bytes.fromhex(args[0]))
            answer("ok")
        elif cmd == "fsync":
            os.fsync(fd)
            answer("ok")
        elif cmd == "poll":
            p = select.poll()
            p.register(fd, select.POLLPRI)
            ev = p.poll(int(args[0]))
            answer("pri" if any(e & select.POLLPRI for _, e in ev) else "none")
        elif cmd == "state":
            answer(os.getxattr(args[0], "user.memos.state").decode())
        elif cmd == "ack":
            os.setxattr(args[0], "user.memos.ack", b"1")
            answer("ok")
        elif cmd == "ioctlack":
            fcntl.ioctl(fd, MEMOS_IOC_ACK)
            answer("ok")
        elif cmd == "close":
            os.close(fd)
            fd = None
            answer("ok")
        else:
            answer("err EINVAL")
    except OSError as e:
        answer("err " + errno.errorcode.get(e.errno, str(e.errno)))
