package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"strings"
)

// withHost answers 421 to a request whose Host is not the dashboard's.
func (s *server) withHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			http.Error(w, "nexjob dashboard: this Host is not the dashboard's address; open it by its own address (or allow the name with AllowedHosts / --allow-host)", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *server) hostAllowed(host string) bool {
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, ""
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	for _, a := range s.o.AllowedHosts {
		a = strings.ToLower(a)
		switch {
		case strings.HasPrefix(a, "."):
			if strings.HasSuffix(name, a) {
				return true
			}
		case strings.EqualFold(a, host) || a == name:
			return true
		}
	}
	if s.o.Addr != "" {
		_, lport, err := net.SplitHostPort(s.o.Addr)
		if err != nil {
			return false
		}
		return strings.EqualFold(host, s.o.Addr) || port == lport && (name == "localhost" || isLoopbackIP(name) && lhost(s.o.Addr) == name)
	}
	return name == "localhost" || isLoopbackIP(name)
}

func lhost(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return strings.Trim(h, "[]")
}

func isLoopbackIP(name string) bool {
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// withHeaders sets the headers every response carries, and no-store on
// everything but the stylesheet.
func withHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		if !strings.HasPrefix(r.URL.Path, "/assets/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

const csp = "default-src 'self'; script-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"

// banners are the texts shown after an action, chosen by the code in the
// redirect's ?done= (never the URL's own text).
var banners = map[string]string{
	"requeued":  "requeued: the job is Enqueued and on its way to a worker",
	"cancelled": "cancelled: the job will not run",
	"deleted":   "deleted the job",
	"redrove":   "redrive done: the dead-letter queue's jobs are back in work (see each job)",
	"holder":    "this job holds the key",
}

// withToken gives every visitor a CSRF token cookie and checks it on
// every POST.
func (s *server) withToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(csrfCookie)
		if err != nil || len(c.Value) < 32 {
			b := make([]byte, 32)
			_, _ = rand.Read(b)
			c = &http.Cookie{Name: csrfCookie, Value: base64.RawURLEncoding.EncodeToString(b), Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"}
			http.SetCookie(w, c)
			r.AddCookie(c)
		}
		if r.Method == http.MethodPost && subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(c.Value)) != 1 {
			http.Error(w, "nexjob dashboard: missing or wrong CSRF token; reload the page and try again", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
